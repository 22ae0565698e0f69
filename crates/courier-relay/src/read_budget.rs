//! What a connection may send before it authenticates (`docs/protocol.md#authentication-limits`):
//! a stream that fails a read once a byte budget is spent, lifted on `Authenticated`. The
//! WebSocket layer's own cap (1 MiB) is set once at the upgrade; this one is what keeps an
//! anonymous peer from making the relay buffer that much.
//!
//! The failed read ends the WebSocket layer's parsing for good; the connection is then only read
//! out as raw bytes into a small buffer (`linger.rs`), so after it the budget is lifted and the
//! peer hears its close code instead of a reset.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes read before authentication, upgrade request included: room for any browser's headers
/// and an `Authenticate` of the largest size allowed.
pub(crate) const UNAUTHENTICATED_READ_BYTES: usize = 32 * 1024;

/// The error a read fails with once the budget is spent.
#[derive(Debug, thiserror::Error)]
#[error("more than {UNAUTHENTICATED_READ_BYTES} bytes before authentication")]
pub(crate) struct OverBudget;

impl OverBudget {
    /// Whether `error` is this one.
    pub fn is(error: &io::Error) -> bool {
        error
            .get_ref()
            .is_some_and(|inner| inner.is::<OverBudget>())
    }
}

pub(crate) struct Budgeted<S> {
    inner: S,
    /// Bytes still allowed; `None` once the connection authenticated.
    left: Option<usize>,
}

impl<S> Budgeted<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            left: Some(UNAUTHENTICATED_READ_BYTES),
        }
    }

    /// The connection authenticated: its reads are no longer counted.
    pub fn lift(&mut self) {
        self.left = None;
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Budgeted<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(left) = this.left else {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        };
        if left == 0 {
            this.left = None;
            return Poll::Ready(Err(io::Error::other(OverBudget)));
        }
        // Never read past the budget, so nothing beyond it is ever buffered. Zeroing the slice
        // first keeps this safe; it is at most one read chunk, and only before authentication.
        let want = left.min(buf.remaining());
        let mut limited = ReadBuf::new(buf.initialize_unfilled_to(want));
        let polled = Pin::new(&mut this.inner).poll_read(cx, &mut limited);
        let read = limited.filled().len();
        buf.advance(read);
        this.left = Some(left - read);
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Budgeted<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
