//! Test harness: a real relay on 127.0.0.1:0 with a SQLite file in a temp dir, and a
//! tokio-tungstenite client that reads frames with deadlines (never fixed sleeps).
#![allow(dead_code)]

pub mod nats;

use std::collections::VecDeque;
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use courier_proto::{ClientFrame, RelayFrame};
use courier_relay::{RelayConfig, RelayHandle, Storage, Timings};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub const SECRET: &[u8] = b"relay-test-secret-of-32-bytes-at-least";

/// The journal table as schema versions 1 to 4 had it, for tests that build an old database.
pub const JOURNAL_BEFORE_V5: &str = "CREATE TABLE journal (
    id INTEGER PRIMARY KEY,
    account TEXT NOT NULL,
    seq INTEGER NOT NULL,
    sender TEXT NOT NULL,
    sender_account TEXT NOT NULL,
    message_id TEXT NOT NULL,
    content TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    reply_to_msg TEXT,
    accepted_ms INTEGER NOT NULL,
    UNIQUE (account, seq),
    UNIQUE (account, sender, message_id)
);
CREATE INDEX journal_accepted ON journal (accepted_ms);";
/// Every wait in the tests is bounded by this.
pub const DEADLINE: Duration = Duration::from_secs(5);

pub fn token(account: &str) -> String {
    courier_relay::issue_token(SECRET, account, 3600).expect("token")
}

/// Short clocks so tests never wait for the real 2–30 s; keepalive stays long unless a test
/// is about keepalive.
pub fn fast_timings() -> Timings {
    Timings {
        drain_grace: Duration::from_millis(50),
        close_linger: Duration::from_millis(500),
        ..Timings::default()
    }
}

/// Whether the relay tests run against relay nodes of a cluster rather than the single-file
/// relay: `COURIER_RELAY_TEST_CLUSTER=1` (`docs/cluster.md#two-modes-one-suite`).
pub fn cluster_mode() -> bool {
    std::env::var_os("COURIER_RELAY_TEST_CLUSTER").is_some_and(|v| v == "1")
}

/// Relay nodes in cluster mode.
pub const CLUSTER_NODES: usize = 3;

pub struct TestRelay {
    /// The relay; in cluster mode the first node.
    pub handle: Option<RelayHandle>,
    pub dir: tempfile::TempDir,
    pub url: String,
    cluster: Option<TestCluster>,
}

/// In cluster mode: the NATS servers, the other relay nodes, and which node the next client
/// connects to (round robin, so a test's accounts land on different nodes).
struct TestCluster {
    nats: nats::NatsCluster,
    others: Vec<RelayHandle>,
    next: std::sync::atomic::AtomicUsize,
}

impl TestRelay {
    pub fn db_path(&self) -> PathBuf {
        assert!(
            self.cluster.is_none(),
            "a test of the SQLite file has no place in cluster mode"
        );
        self.dir.path().join("relay.db")
    }

    pub fn config(&self) -> RelayConfig {
        let storage = match &self.cluster {
            None => Storage::Path(self.dir.path().join("relay.db")),
            Some(cluster) => {
                let mut storage = courier_relay::ClusterStorage::new(cluster.nats.urls());
                storage.presence_ttl = Duration::from_secs(2);
                Storage::Cluster(storage)
            }
        };
        let mut config = RelayConfig::new("127.0.0.1:0".parse().unwrap(), storage, SECRET.to_vec());
        config.timings = fast_timings();
        config
    }

    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// A single-file relay not started yet, for a test that prepares its database first.
    pub fn unstarted() -> Self {
        Self {
            handle: None,
            dir: tempfile::tempdir().unwrap(),
            url: String::new(),
            cluster: None,
        }
    }

    pub async fn start_with(adjust: impl FnOnce(&mut RelayConfig)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let cluster = if cluster_mode() {
            Some(TestCluster {
                nats: nats::NatsCluster::start(3).await,
                others: Vec::new(),
                next: Default::default(),
            })
        } else {
            None
        };
        let mut relay = Self {
            handle: None,
            dir,
            url: String::new(),
            cluster,
        };
        let mut config = relay.config();
        adjust(&mut config);
        relay.run(config).await;
        relay
    }

    pub async fn run(&mut self, mut config: RelayConfig) {
        if let Some(cluster) = &mut self.cluster {
            // JetStream reserves the journal's bytes on every server holding a replica.
            if let Some(mailbox) = &mut config.mailbox {
                mailbox.max_journal_bytes = mailbox.max_journal_bytes.min(256 * 1024 * 1024);
            }
            for _ in 1..CLUSTER_NODES {
                let node = courier_relay::start(config.clone())
                    .await
                    .expect("relay node starts");
                cluster.others.push(node);
            }
        }
        let handle = courier_relay::start(config).await.expect("relay starts");
        self.url = handle.url();
        self.handle = Some(handle);
    }

    pub fn handle(&self) -> &RelayHandle {
        self.handle.as_ref().expect("relay running")
    }

    pub async fn stop(&mut self) {
        if let Some(handle) = self.handle.take() {
            handle.stop().await;
        }
        if let Some(cluster) = &mut self.cluster {
            for node in cluster.others.drain(..) {
                node.stop().await;
            }
        }
    }

    /// Stops and starts again on the same database file (in cluster mode: every node, on the
    /// same NATS servers).
    pub async fn restart_with(&mut self, adjust: impl FnOnce(&mut RelayConfig)) {
        self.stop().await;
        let mut config = self.config();
        adjust(&mut config);
        self.run(config).await;
    }

    /// A client of the relay; in cluster mode of the next node in turn.
    pub async fn client(&self) -> Client {
        let Some(cluster) = &self.cluster else {
            return Client::connect(&self.url).await;
        };
        let turn = cluster
            .next
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            % CLUSTER_NODES;
        let url = match turn {
            0 => self.url.clone(),
            n => cluster.others[n - 1].url(),
        };
        let mut client = Client::connect(&url).await;
        client.wait_up_to(nats::CLUSTER_DEADLINE);
        client
    }

    /// An opted-in client whose drain is over (DrainComplete{0} expected).
    pub async fn online(&self, account: &str) -> Client {
        let mut c = self.client().await;
        c.authenticate(account, true).await;
        let count = c.drain_complete().await;
        assert_eq!(count, 0, "{account} was expected to have an empty mailbox");
        c
    }

    /// `account` on a new opted-in connection, authenticated, its declaration of `key`'s
    /// address sent and not yet answered.
    pub async fn declaring(&self, account: &str, key: &courier_proto::IdentityKey) -> Client {
        let mut c = self.client().await;
        let RelayFrame::Authenticated {
            address_challenge, ..
        } = c.authenticate(account, true).await
        else {
            unreachable!()
        };
        let declaration =
            courier_proto::declare_address_frame(key, Some(account), address_challenge.as_deref())
                .unwrap();
        c.send(&declaration).await;
        c
    }

    /// An opted-in client that declared `key`'s address as its first frame, once its (empty)
    /// drain is over.
    pub async fn online_declared(&self, account: &str, key: &courier_proto::IdentityKey) -> Client {
        let mut c = self.declaring(account, key).await;
        let bound = key.address().to_string();
        c.next_where(|f| matches!(f, RelayFrame::AddressDeclared { address } if *address == bound))
            .await;
        assert_eq!(c.drain_complete().await, 0);
        c
    }

    /// Makes `account` known to the relay (accounts exist from their first authentication).
    pub async fn register(&self, account: &str) {
        let mut c = self.client().await;
        c.authenticate(account, true).await;
        c.close().await;
    }

    /// Opens a connection, sends `first`, and returns the AuthError reason and how the
    /// connection ended.
    pub async fn refused(&self, first: &str) -> (String, Ending) {
        let mut c = self.client().await;
        c.send_text(first).await;
        let (frames, ending) = c.frames_until_end().await;
        match frames.as_slice() {
            [RelayFrame::AuthError { reason }] => (reason.clone(), ending),
            other => panic!("expected exactly one AuthError for {first}, got {other:?}"),
        }
    }

    /// Journal frames not yet released or expired.
    pub async fn stored_frames(&self) -> u64 {
        self.stats().await.stored_frames
    }

    /// The relay's stats; in cluster mode connections and watches summed over the nodes, and
    /// the journal's frames and the accounts read from JetStream now.
    pub async fn stats(&self) -> courier_relay::RelayStats {
        let mut stats = self.handle().stats();
        let Some(cluster) = &self.cluster else {
            return stats;
        };
        for node in &cluster.others {
            let other = node.stats();
            stats.connections += other.connections;
            stats.watches += other.watches;
        }
        let (frames, accounts) = cluster.nats.deployment_figures().await;
        stats.stored_frames = frames;
        stats.accounts = accounts;
        stats
    }

    /// Polls the stats until `check` holds or the deadline passes.
    pub async fn wait_stats(&self, what: &str, check: impl Fn(courier_relay::RelayStats) -> bool) {
        let reached = within(async {
            while !check(self.stats().await) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(
            reached.is_some(),
            "timed out waiting for {what}; stats = {:?}",
            self.stats().await
        );
    }
}

pub async fn within<T>(f: impl Future<Output = T>) -> Option<T> {
    tokio::time::timeout(DEADLINE, f).await.ok()
}

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

pub struct Client {
    pub ws: Ws,
    buffered: VecDeque<RelayFrame>,
    /// How long a read waits for the next frame.
    patience: Duration,
}

/// How a connection ended, as the client saw it.
#[derive(Debug, PartialEq, Eq)]
pub enum Ending {
    Close(u16),
    /// EOF or reset without a Close frame.
    Dropped,
}

impl Client {
    pub async fn connect(url: &str) -> Self {
        let (ws, _) = within(tokio_tungstenite::connect_async(url))
            .await
            .expect("connect in time")
            .expect("connect");
        Self::from_ws(ws)
    }

    /// A client whose socket holds at most `bytes` of unsent data: a large message is still
    /// being written when the relay has read its header, not already queued in the kernel.
    pub async fn connect_with_send_buffer(addr: std::net::SocketAddr, bytes: u32) -> Self {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_send_buffer_size(bytes).unwrap();
        let tcp = socket.connect(addr).await.unwrap();
        let (ws, _) = within(tokio_tungstenite::client_async(
            format!("ws://{addr}"),
            MaybeTlsStream::Plain(tcp),
        ))
        .await
        .expect("connect in time")
        .expect("connect");
        Self::from_ws(ws)
    }

    pub fn from_ws(ws: Ws) -> Self {
        Self {
            ws,
            buffered: VecDeque::new(),
            patience: DEADLINE,
        }
    }

    /// Makes every later read wait up to `limit` for its frame, for frames due after a relay
    /// clock longer than the usual deadline allows for.
    pub fn wait_up_to(&mut self, limit: Duration) {
        self.patience = limit;
    }

    pub async fn send_text(&mut self, text: impl Into<String>) {
        self.ws
            .send(Message::text(text.into()))
            .await
            .expect("send");
    }

    pub async fn send_json(&mut self, value: Value) {
        self.send_text(value.to_string()).await;
    }

    pub async fn send(&mut self, frame: &ClientFrame) {
        self.send_text(frame.encode()).await;
    }

    pub async fn send_message(&mut self, recipient: &str, message_id: &str, content: &str) {
        self.send(&ClientFrame::SendMessage {
            recipient: recipient.into(),
            content: content.into(),
            message_id: message_id.into(),
            reply_to_msg: None,
        })
        .await;
    }

    /// Sends and returns the answer (MessageSent, DeliveryError, Error or RateLimited),
    /// keeping other frames for later reads.
    pub async fn send_and_answer(
        &mut self,
        recipient: &str,
        message_id: &str,
        content: &str,
    ) -> RelayFrame {
        self.send_message(recipient, message_id, content).await;
        self.answer().await
    }

    /// The answer to the `SendMessage` just sent, as [`Client::send_and_answer`] waits for it.
    pub async fn answer(&mut self) -> RelayFrame {
        self.next_where(|f| {
            matches!(
                f,
                RelayFrame::MessageSent { .. }
                    | RelayFrame::DeliveryError { .. }
                    | RelayFrame::Error { .. }
                    | RelayFrame::RateLimited { .. }
            )
        })
        .await
    }

    async fn read_frame(&mut self) -> Result<RelayFrame, Ending> {
        loop {
            let message = tokio::time::timeout(self.patience, self.ws.next())
                .await
                .expect("a frame within the deadline");
            match message {
                Some(Ok(Message::Text(text))) => {
                    return Ok(RelayFrame::decode(&text)
                        .unwrap_or_else(|e| panic!("bad relay frame {text}: {e}")))
                }
                Some(Ok(Message::Close(frame))) => {
                    return Err(Ending::Close(frame.map_or(1005, |f| u16::from(f.code))));
                }
                Some(Ok(Message::Binary(_))) => panic!("the relay sent a binary message"),
                Some(Ok(_)) => continue,
                Some(Err(_)) | None => return Err(Ending::Dropped),
            }
        }
    }

    pub async fn next_frame(&mut self) -> RelayFrame {
        if let Some(frame) = self.buffered.pop_front() {
            return frame;
        }
        match self.read_frame().await {
            Ok(frame) => frame,
            Err(ending) => panic!("connection ended ({ending:?}) while a frame was expected"),
        }
    }

    /// The first frame matching `pred`; frames read before it are kept for `next_frame`.
    pub async fn next_where(&mut self, pred: impl Fn(&RelayFrame) -> bool) -> RelayFrame {
        if let Some(i) = self.buffered.iter().position(&pred) {
            return self.buffered.remove(i).unwrap();
        }
        loop {
            let frame = match self.read_frame().await {
                Ok(frame) => frame,
                Err(ending) => panic!(
                    "connection ended ({ending:?}); buffered: {:?}",
                    self.buffered
                ),
            };
            if pred(&frame) {
                return frame;
            }
            self.buffered.push_back(frame);
        }
    }

    /// Every frame up to the end of the connection, and how it ended.
    pub async fn frames_until_end(&mut self) -> (Vec<RelayFrame>, Ending) {
        let mut frames: Vec<RelayFrame> = self.buffered.drain(..).collect();
        loop {
            match self.read_frame().await {
                Ok(frame) => frames.push(frame),
                Err(ending) => {
                    // Reading on sends our Close reply, which ends the relay's linger.
                    let _ = within(async { while let Some(Ok(_)) = self.ws.next().await {} }).await;
                    return (frames, ending);
                }
            }
        }
    }

    pub async fn authenticate_with(&mut self, token: &str, opted_in: bool) {
        let caps = if opted_in {
            json!(["mailbox_v1"])
        } else {
            Value::Null
        };
        self.send_json(
            json!({"type": "Authenticate", "token": token, "client_capabilities": caps}),
        )
        .await;
    }

    /// Authenticates and returns the Authenticated frame.
    pub async fn authenticate(&mut self, account: &str, opted_in: bool) -> RelayFrame {
        self.authenticate_with(&token(account), opted_in).await;
        let frame = self.next_frame().await;
        assert!(
            matches!(&frame, RelayFrame::Authenticated { username, .. } if username == account),
            "expected Authenticated for {account}, got {frame:?}"
        );
        frame
    }

    /// Reads up to DrainComplete; returns its count, keeping the drained frames buffered.
    pub async fn drain_complete(&mut self) -> u64 {
        match self
            .next_where(|f| matches!(f, RelayFrame::DrainComplete { .. }))
            .await
        {
            RelayFrame::DrainComplete { count } => count,
            _ => unreachable!(),
        }
    }

    /// The drained MessageReceived frames, then the DrainComplete count.
    pub async fn drain(&mut self) -> (Vec<Received>, u64) {
        let mut received = Vec::new();
        let mut others = VecDeque::new();
        loop {
            match self.next_frame().await {
                frame @ RelayFrame::MessageReceived { .. } => received.push(Received::from(frame)),
                RelayFrame::DrainComplete { count } => {
                    others.extend(self.buffered.drain(..));
                    self.buffered = others;
                    return (received, count);
                }
                other => others.push_back(other),
            }
        }
    }

    /// Every frame up to and including the first that matches `pred`, buffered ones first.
    pub async fn frames_through(&mut self, pred: impl Fn(&RelayFrame) -> bool) -> Vec<RelayFrame> {
        let mut frames = Vec::new();
        loop {
            let frame = self.next_frame().await;
            let last = pred(&frame);
            frames.push(frame);
            if last {
                return frames;
            }
        }
    }

    pub async fn received(&mut self) -> Received {
        Received::from(
            self.next_where(|f| matches!(f, RelayFrame::MessageReceived { .. }))
                .await,
        )
    }

    pub async fn ack(&mut self, seq: u64) {
        self.send(&ClientFrame::Ack { seq }).await;
    }

    pub async fn ack_up_to(&mut self, seq: u64) {
        self.send(&ClientFrame::AckUpTo { seq }).await;
    }

    /// A round trip: once answered, every earlier frame of this connection has been handled
    /// (the relay processes frames strictly in order, acks included).
    pub async fn sync(&mut self) {
        self.send(&ClientFrame::CheckPresence {
            username: "sync".into(),
        })
        .await;
        self.next_where(
            |f| matches!(f, RelayFrame::PresenceStatus { user_id, .. } if user_id == "sync"),
        )
        .await;
    }

    /// Every frame before the answer to a fresh round trip (see `sync`), buffered ones
    /// first. Answers to earlier frames, and presence statuses the relay queued for this
    /// connection before it handled the round trip, are all in it: a test can assert that
    /// something was *not* sent without sleeping.
    pub async fn until_synced(&mut self) -> Vec<RelayFrame> {
        self.send(&ClientFrame::CheckPresence {
            username: "sync".into(),
        })
        .await;
        let mut frames: Vec<RelayFrame> = self.buffered.drain(..).collect();
        loop {
            match self.read_frame().await {
                Ok(RelayFrame::PresenceStatus { user_id, .. }) if user_id == "sync" => {
                    return frames
                }
                Ok(frame) => frames.push(frame),
                Err(ending) => panic!("connection ended ({ending:?}); frames: {frames:?}"),
            }
        }
    }

    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
        let _ = within(async { while let Some(Ok(_)) = self.ws.next().await {} }).await;
    }
}

/// A MessageReceived, flattened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub seq: Option<u64>,
    pub sender: String,
    pub sender_account: Option<String>,
    pub content: String,
    pub message_id: String,
    pub timestamp: u64,
    pub reply_to_msg: Option<String>,
}

impl From<RelayFrame> for Received {
    fn from(frame: RelayFrame) -> Self {
        match frame {
            RelayFrame::MessageReceived {
                seq,
                sender,
                sender_account,
                content,
                message_id,
                timestamp,
                reply_to_msg,
            } => Self {
                seq,
                sender,
                sender_account,
                content,
                message_id,
                timestamp,
                reply_to_msg,
            },
            other => panic!("expected MessageReceived, got {other:?}"),
        }
    }
}

pub fn assert_sent(frame: &RelayFrame, message_id: &str, recipient: &str, disposition: &str) {
    match frame {
        RelayFrame::MessageSent {
            message_id: m,
            recipient: r,
            disposition: Some(d),
            ..
        } => {
            assert_eq!((m.as_str(), r.as_str()), (message_id, recipient));
            assert_eq!(
                serde_json::to_value(d).unwrap(),
                json!(disposition),
                "disposition"
            );
        }
        other => panic!("expected MessageSent {message_id} {disposition}, got {other:?}"),
    }
}

pub fn assert_unreachable(frame: &RelayFrame, message_id: &str, recipient: &str, detail: &str) {
    match frame {
        RelayFrame::DeliveryError {
            message_id: Some(m),
            recipient: r,
            reason,
        } => {
            assert_eq!((m.as_str(), r.as_str()), (message_id, recipient));
            assert_eq!(reason, &format!("recipient_unreachable: {detail}"));
        }
        other => panic!("expected DeliveryError {detail}, got {other:?}"),
    }
}

/// A WebSocket client written by hand, for what tokio-tungstenite will not do: send invalid
/// UTF-8, or never answer Pings.
pub struct RawClient {
    tcp: TcpStream,
    buf: Vec<u8>,
}

impl RawClient {
    pub async fn connect(addr: std::net::SocketAddr) -> Self {
        Self::upgrade(TcpStream::connect(addr).await.unwrap()).await
    }

    /// A client whose socket takes in at most `bytes` before the relay's writes must wait: a
    /// peer that stops reading blocks the relay quickly instead of after megabytes.
    pub async fn connect_with_receive_window(addr: std::net::SocketAddr, bytes: u32) -> Self {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(bytes).unwrap();
        Self::upgrade(socket.connect(addr).await.unwrap()).await
    }

    async fn upgrade(mut tcp: TcpStream) -> Self {
        let addr = tcp.peer_addr().unwrap();
        let request = format!(
            "GET / HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        tcp.write_all(request.as_bytes()).await.unwrap();
        let mut raw = Self {
            tcp,
            buf: Vec::new(),
        };
        let end = loop {
            if let Some(i) = raw.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            assert!(raw.fill().await, "the relay closed during the upgrade");
        };
        let head = String::from_utf8_lossy(&raw.buf[..end]).to_string();
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        raw.buf.drain(..end);
        raw
    }

    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        match within(self.tcp.read(&mut chunk))
            .await
            .expect("relay bytes within the deadline")
        {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// Writes one final, masked frame.
    pub async fn send_frame(&mut self, opcode: u8, payload: &[u8]) {
        self.send_fragment(true, opcode, payload).await;
    }

    /// Writes one masked frame; `fin` false leaves the message open for continuation frames
    /// (opcode 0).
    pub async fn send_fragment(&mut self, fin: bool, opcode: u8, payload: &[u8]) {
        self.write_fragment(fin, opcode, payload).await.unwrap();
    }

    /// `send_fragment` that reports a broken connection instead of panicking.
    pub async fn write_fragment(
        &mut self,
        fin: bool,
        opcode: u8,
        payload: &[u8],
    ) -> std::io::Result<()> {
        let mut frame = Self::header(fin, opcode, payload.len() as u64);
        frame.extend(
            payload
                .iter()
                .enumerate()
                .map(|(i, b)| b ^ Self::MASK[i % 4]),
        );
        self.tcp.write_all(&frame).await
    }

    /// Writes only the header of a final frame announcing `len` payload bytes, and no payload.
    pub async fn announce_frame(&mut self, opcode: u8, len: u64) {
        let header = Self::header(true, opcode, len);
        self.tcp.write_all(&header).await.unwrap();
    }

    const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

    fn header(fin: bool, opcode: u8, len: u64) -> Vec<u8> {
        let mut header = vec![if fin { 0x80 } else { 0 } | opcode];
        if len < 126 {
            header.push(0x80 | len as u8);
        } else if len <= 0xffff {
            header.push(0x80 | 126);
            header.extend_from_slice(&(len as u16).to_be_bytes());
        } else {
            header.push(0x80 | 127);
            header.extend_from_slice(&len.to_be_bytes());
        }
        header.extend_from_slice(&Self::MASK);
        header
    }

    /// The next frame as (opcode, payload); `None` once the relay closed the TCP connection.
    pub async fn read_frame(&mut self) -> Option<(u8, Vec<u8>)> {
        loop {
            if let Some(frame) = self.parse_frame() {
                return Some(frame);
            }
            if !self.fill().await {
                return None;
            }
        }
    }

    /// Takes one whole frame from the bytes read so far.
    fn parse_frame(&mut self) -> Option<(u8, Vec<u8>)> {
        if self.buf.len() < 2 {
            return None;
        }
        let opcode = self.buf[0] & 0x0f;
        let (len, header) = match self.buf[1] & 0x7f {
            126 if self.buf.len() >= 4 => (
                usize::from(u16::from_be_bytes([self.buf[2], self.buf[3]])),
                4,
            ),
            127 if self.buf.len() >= 10 => {
                let mut b = [0u8; 8];
                b.copy_from_slice(&self.buf[2..10]);
                (u64::from_be_bytes(b) as usize, 10)
            }
            n @ 0..=125 => (usize::from(n), 2),
            _ => return None,
        };
        if self.buf.len() < header + len {
            return None;
        }
        let payload = self.buf[header..header + len].to_vec();
        self.buf.drain(..header + len);
        Some((opcode, payload))
    }

    /// Authenticates as our client does, opted in to `mailbox_v1`.
    pub async fn authenticate(&mut self, account: &str) {
        self.authenticate_with(json!({"type": "Authenticate", "token": token(account), "client_capabilities": ["mailbox_v1"]}))
            .await;
    }

    /// Authenticates as a client written to the published contract: no `client_capabilities`.
    pub async fn authenticate_published(&mut self, account: &str) {
        self.authenticate_with(json!({"type": "Authenticate", "token": token(account)}))
            .await;
    }

    async fn authenticate_with(&mut self, auth: Value) {
        self.send_json(auth).await;
        let frame = self.next_relay_frame().await;
        assert!(
            matches!(frame, RelayFrame::Authenticated { .. }),
            "{frame:?}"
        );
    }

    /// The next text frame as JSON, exactly as the relay wrote it (Pings are skipped, never
    /// answered).
    pub async fn next_json(&mut self) -> Value {
        loop {
            match self.read_frame().await {
                Some((0x1, payload)) => {
                    return serde_json::from_slice(&payload).expect("a JSON text frame")
                }
                Some((0x9, _)) => continue,
                other => panic!("a text frame expected, got {other:?}"),
            }
        }
    }

    /// The next text frame, decoded.
    pub async fn next_relay_frame(&mut self) -> RelayFrame {
        let json = self.next_json().await.to_string();
        RelayFrame::decode(&json).unwrap_or_else(|e| panic!("bad relay frame {json}: {e}"))
    }

    pub async fn send_json(&mut self, frame: Value) {
        self.send_frame(0x1, frame.to_string().as_bytes()).await;
    }

    /// Every frame the relay sends until it closes the TCP connection, which it must do within
    /// `limit` (for deadlines longer than `DEADLINE`).
    pub async fn frames_until_closed(&mut self, limit: Duration) -> Vec<(u8, Vec<u8>)> {
        // A reset after the relay's last bytes still leaves them in `buf`.
        let _ = tokio::time::timeout(limit, self.tcp.read_to_end(&mut self.buf))
            .await
            .expect("the relay closes the connection in time");
        std::iter::from_fn(|| self.parse_frame()).collect()
    }

    /// Reads until the relay's Close frame and returns its code (skipping Pings and text).
    pub async fn close_code(&mut self) -> Option<u16> {
        while let Some((opcode, payload)) = self.read_frame().await {
            if opcode == 0x8 {
                return (payload.len() >= 2).then(|| u16::from_be_bytes([payload[0], payload[1]]));
            }
        }
        None
    }
}

/// The relay binary as a child process; killed (SIGKILL) when dropped.
pub struct RelayProcess {
    pub child: Child,
    pub url: String,
}

impl RelayProcess {
    /// One sender may fill a mailbox: the crash tests journal whole bursts from one account.
    pub fn spawn(db: &Path, secret_file: &Path) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_courier-relay"));
        command.arg("--db").arg(db).stderr(Stdio::null());
        Self::spawn_command(command, secret_file, DEADLINE)
    }

    /// A relay node of the cluster on the NATS servers `nats` (`docs/cluster.md`), its log
    /// appended to `log`. The journal's bytes fit the test servers' stores.
    pub fn spawn_node(nats: &[String], secret_file: &Path, log: &Path) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_courier-relay"));
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(log)
            .expect("the node's log file");
        command
            .arg("--cluster")
            .arg(nats.join(","))
            .args(["--journal-max-bytes", "268435456"])
            // A killed node's accounts go offline on the other nodes within seconds.
            .args(["--cluster-presence-ttl-ms", "2000"])
            .stderr(log);
        Self::spawn_command(command, secret_file, nats::CLUSTER_DEADLINE)
    }

    fn spawn_command(mut command: Command, secret_file: &Path, patience: Duration) -> Self {
        let mut child = command
            .args(["--listen", "127.0.0.1:0"])
            .arg("--jwt-secret-file")
            .arg(secret_file)
            .args(["--mailbox-sender-share-percent", "100"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn courier-relay");
        let stdout = child.stdout.take().expect("stdout");
        // Blocking read of one line on a helper thread, bounded by the deadline.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(patience).expect("the relay prints its URL");
        let url = line
            .trim()
            .strip_prefix("courier-relay listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        assert!(url.starts_with("ws://127.0.0.1:"), "{url}");
        Self { child, url }
    }

    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the relay did not exit"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    pub fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
    }

    /// File descriptors the relay process holds open (sockets, database, pipes).
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .expect("the relay's fd table")
            .count()
    }

    /// The relay process's resident memory, in KiB.
    pub fn resident_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("the relay's status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS")
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` on the relay's monitoring listener over HTTP/1.0 (one request per connection,
/// the server closes after answering): the status code and the body.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    http_request(addr, "GET", path).await
}

pub async fn http_request(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, String) {
    let exchange = async {
        let mut tcp = TcpStream::connect(addr).await.expect("connect to /metrics");
        let request = format!("{method} {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        tcp.write_all(request.as_bytes()).await.expect("request");
        let mut response = Vec::new();
        tcp.read_to_end(&mut response).await.expect("response");
        String::from_utf8(response).expect("a UTF-8 response")
    };
    let response = within(exchange).await.expect("an HTTP answer in time");
    let (head, body) = response.split_once("\r\n\r\n").expect("a head and a body");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    (status, body.to_owned())
}

/// The value of one series (`name` or `name{label="value"}`) in a Prometheus text exposition.
pub fn metric(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        Some(value.trim().parse().expect("a number"))
    })
}

/// Scrapes `/metrics` until `series` satisfies `check`, within the deadline; returns the
/// exposition that did.
pub async fn wait_metric(
    addr: std::net::SocketAddr,
    series: &str,
    check: impl Fn(f64) -> bool,
) -> String {
    let mut last = String::new();
    let reached = within(async {
        loop {
            let (status, body) = http_get(addr, "/metrics").await;
            assert_eq!(status, 200);
            if metric(&body, series).is_some_and(&check) {
                return body;
            }
            last = body;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    reached.unwrap_or_else(|| panic!("timed out waiting for {series}; last scrape:\n{last}"))
}
