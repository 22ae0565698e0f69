//! One client connection over loopback. A reader task forwards everything the relay sends to
//! the harness, which judges it; the task itself asserts nothing, so a failed check fails the
//! calling test or fuzz run instead of a detached task.

use std::time::Duration;

use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// Every wait for the relay is bounded by this; running out of it is a finding (a hang).
pub const DEADLINE: Duration = Duration::from_secs(10);

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

#[derive(Debug)]
pub enum Incoming {
    Text(String),
    Binary,
    Ended(Ending),
}

/// How the connection ended, as the client saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The relay's Close frame and its code, if it carried one.
    Close(Option<u16>),
    /// EOF or a socket error without a Close frame.
    Dropped,
}

pub struct Conn {
    sink: SplitSink<Ws, Message>,
    incoming: mpsc::UnboundedReceiver<Incoming>,
    reader: JoinHandle<()>,
    /// Set once `Incoming::Ended` has been handed out.
    pub ended: Option<Ending>,
    /// A send failed: the socket is going away, only reading is left.
    pub broken: bool,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Conn {
    pub async fn open(url: &str) -> Self {
        let (ws, _) = tokio::time::timeout(DEADLINE, tokio_tungstenite::connect_async(url))
            .await
            .expect("the relay accepts a connection in time")
            .expect("the relay accepts a connection");
        let (sink, stream) = ws.split();
        let (tx, incoming) = mpsc::unbounded_channel();
        Self {
            sink,
            incoming,
            reader: tokio::spawn(read(stream, tx)),
            ended: None,
            broken: false,
        }
    }

    /// Whether the connection can still carry a frame from the client.
    pub fn writable(&self) -> bool {
        self.ended.is_none() && !self.broken
    }

    pub async fn send(&mut self, message: Message) -> bool {
        if !self.writable() {
            return false;
        }
        if self.sink.send(message).await.is_err() {
            self.broken = true;
        }
        !self.broken
    }

    pub async fn send_text(&mut self, text: String) -> bool {
        self.send(Message::text(text)).await
    }

    /// Starts the closing handshake with 1000.
    pub async fn close(&mut self) -> bool {
        self.send(Message::Close(Some(CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        })))
        .await
    }

    /// The next thing the relay sent; `None` once the end has been handed out. Panics when
    /// the relay stays silent past the deadline.
    pub async fn next(&mut self) -> Option<Incoming> {
        if self.ended.is_some() {
            return None;
        }
        let incoming = tokio::time::timeout(DEADLINE, self.incoming.recv())
            .await
            .expect("the relay answers within the deadline");
        Some(self.received(incoming))
    }

    /// What the relay has sent and the reader has forwarded so far, without waiting.
    pub fn try_next(&mut self) -> Option<Incoming> {
        if self.ended.is_some() {
            return None;
        }
        match self.incoming.try_recv() {
            Ok(incoming) => Some(self.received(Some(incoming))),
            Err(mpsc::error::TryRecvError::Empty) => None,
            Err(mpsc::error::TryRecvError::Disconnected) => Some(self.received(None)),
        }
    }

    fn received(&mut self, incoming: Option<Incoming>) -> Incoming {
        let incoming = incoming.unwrap_or(Incoming::Ended(Ending::Dropped));
        if let Incoming::Ended(ending) = incoming {
            self.ended = Some(ending);
        }
        incoming
    }
}

async fn read(mut stream: SplitStream<Ws>, tx: mpsc::UnboundedSender<Incoming>) {
    let mut ending = Ending::Dropped;
    // Reading on after a Close flushes tungstenite's reply, and then the stream ends.
    while let Some(Ok(message)) = stream.next().await {
        let incoming = match message {
            Message::Text(text) => Incoming::Text(text.as_str().to_owned()),
            Message::Binary(_) => Incoming::Binary,
            Message::Close(frame) => {
                ending = Ending::Close(frame.map(|f| u16::from(f.code)));
                continue;
            }
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => continue,
        };
        if tx.send(incoming).is_err() {
            return;
        }
    }
    let _ = tx.send(Incoming::Ended(ending));
}
