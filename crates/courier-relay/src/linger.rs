//! The end of a connection this side closes, shared by the relay and the gateway daemon.
//!
//! The peer may still be writing when we decide to close: a WebSocket client in the middle of a
//! message over the size limit, a device in the middle of an overlong line. Closing a socket
//! with unread input makes the kernel answer with a reset, and a reset makes the peer's next
//! write fail before it ever reads our last words (the Close frame with its code, the refusal
//! line). So after those words we read on, discarding, until the peer is done too, bounded in
//! bytes and time.

use std::time::Duration;

use courier_proto::limits::MAX_FRAME_BYTES;
use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;

/// Bytes read out at most: the rest of one refused message or line and one more in flight
/// behind it. A peer that sends more is not finishing a write but flooding.
const READ_OUT_LIMIT: usize = 2 * MAX_FRAME_BYTES;

/// Whether the WebSocket layer can still parse what the peer sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Input {
    /// It can: reading on reaches the peer's Close reply.
    Parsing,
    /// It failed on the peer's input (a message over the limit, invalid UTF-8): the rest of that
    /// input can only be read as bytes.
    Failed,
}

/// Our Close frame is written: reads until the close handshake ends. Through the WebSocket while
/// it parses, so the peer's Close reply ends the read and this side closes the TCP connection
/// first, as RFC 6455 has a server do; as bytes once it cannot.
pub(crate) async fn read_out_websocket<S>(
    ws: &mut WebSocketStream<S>,
    input: Input,
    linger: Duration,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let deadline = Instant::now() + linger;
    if input == Input::Parsing {
        let parsed = tokio::time::timeout_at(deadline, async {
            let mut read = 0;
            while read < READ_OUT_LIMIT {
                match ws.next().await {
                    Some(Ok(message)) => read += message.len(),
                    // The peer's Close reply was read: the handshake is over.
                    None => return Input::Parsing,
                    Some(Err(_)) => return Input::Failed,
                }
            }
            Input::Parsing
        })
        .await;
        if parsed != Ok(Input::Failed) {
            return;
        }
    }
    let left = deadline.saturating_duration_since(Instant::now());
    close_after_reading_out(ws.get_mut(), left).await;
}

/// Our last words are written and nothing more can be parsed: shuts our sending side down, then
/// reads and discards until the peer closes its side, `linger` passes or [`READ_OUT_LIMIT`]
/// bytes were read. Whatever the outcome, the caller drops the socket next.
pub(crate) async fn close_after_reading_out<S>(stream: &mut S, linger: Duration)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let _ = tokio::time::timeout(linger, async {
        // Under TLS this also sends close_notify, which is written like any other bytes.
        if stream.shutdown().await.is_err() {
            return;
        }
        let mut chunk = [0u8; 8192];
        let mut read = 0;
        while read < READ_OUT_LIMIT {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read += n,
            }
        }
    })
    .await;
}
