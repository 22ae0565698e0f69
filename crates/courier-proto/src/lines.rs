//! Newline-delimited framing (`docs/protocol.md#gateway-framing`): one UTF-8 JSON object per
//! `\n`-terminated line of at most 1 MiB. The caller pushes the bytes it read and pops complete
//! lines, so the limit is enforced as bytes arrive, before a line is complete.

use crate::limits::MAX_FRAME_BYTES;

/// The longest line accepted, not counting its `\n` (nor a `\r` before it).
pub const MAX_LINE_BYTES: usize = MAX_FRAME_BYTES;

/// A line grew past [`MAX_LINE_BYTES`]: the connection must close.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a line over {MAX_LINE_BYTES} bytes")]
pub struct LineTooLong;

/// Bytes read and not yet returned as lines. Holds at most one partial line of the limit plus
/// what the last push brought.
#[derive(Debug, Default)]
pub struct LineBuffer {
    buf: Vec<u8>,
    /// The first `scanned` bytes hold no `\n`.
    scanned: usize,
}

impl LineBuffer {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete line without its terminator; `Ok(None)` until one is complete.
    pub fn pop(&mut self) -> Result<Option<Vec<u8>>, LineTooLong> {
        match self.buf[self.scanned..].iter().position(|&b| b == b'\n') {
            Some(at) => {
                let end = self.scanned + at;
                let mut line: Vec<u8> = self.buf.drain(..=end).collect();
                self.scanned = 0;
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                if line.len() > MAX_LINE_BYTES {
                    return Err(LineTooLong);
                }
                Ok(Some(line))
            }
            None => {
                self.scanned = self.buf.len();
                // One byte of slack for a `\r` before the `\n` still to come.
                if self.buf.len() > MAX_LINE_BYTES + 1 {
                    return Err(LineTooLong);
                }
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(chunks: &[&[u8]]) -> Vec<Result<Vec<u8>, LineTooLong>> {
        let mut buffer = LineBuffer::default();
        let mut out = Vec::new();
        for chunk in chunks {
            buffer.push(chunk);
            loop {
                match buffer.pop() {
                    Ok(Some(line)) => out.push(Ok(line)),
                    Ok(None) => break,
                    Err(e) => {
                        out.push(Err(e));
                        return out;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn splits_on_newlines_across_pushes() {
        assert_eq!(
            lines(&[b"{\"a\":", b"1}\n\r", b"\nsecond line\r\nta", b"il"]),
            vec![
                Ok(b"{\"a\":1}".to_vec()),
                Ok(Vec::new()),
                Ok(b"second line".to_vec()),
            ]
        );
    }

    #[test]
    fn limit_is_one_mebibyte_of_content() {
        let exact = vec![b'x'; MAX_LINE_BYTES];
        assert_eq!(
            lines(&[&exact, b"\r\n"]),
            vec![Ok(vec![b'x'; MAX_LINE_BYTES])]
        );
        let over = vec![b'x'; MAX_LINE_BYTES + 1];
        assert_eq!(lines(&[&over, b"\n"]), vec![Err(LineTooLong)]);
        // No newline at all: refused as soon as the limit is passed, not when the line ends.
        assert_eq!(
            lines(&[&vec![b'y'; MAX_LINE_BYTES], b"yy"]),
            vec![Err(LineTooLong)]
        );
    }
}
