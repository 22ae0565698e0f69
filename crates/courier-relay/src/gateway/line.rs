//! Newline-delimited framing (`identity.md` §6): one UTF-8 JSON object per `\n`-terminated line
//! of at most 1 MiB.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// The longest line accepted, not counting its `\n` (nor a `\r` before it).
pub const MAX_LINE_BYTES: usize = courier_proto::limits::MAX_FRAME_BYTES;

/// What one read produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A complete line, without its terminator.
    Complete(Vec<u8>),
    /// The line grew past [`MAX_LINE_BYTES`]; the connection must close.
    TooLong,
    /// The peer closed (an unterminated tail is dropped).
    Eof,
}

/// Reads the next line. Cancel-safe: the partial line lives in `partial`, so a caller may drop
/// the future inside `select!` and call again with the same buffer to continue.
pub async fn next_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    partial: &mut Vec<u8>,
) -> std::io::Result<Line> {
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            partial.clear();
            return Ok(Line::Eof);
        }
        let (take, done) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (available.len(), false),
        };
        // One byte of slack for a `\r` before the `\n`; checked exactly once the line ends.
        let too_long = partial.len() + take > MAX_LINE_BYTES + 1;
        if !too_long {
            partial.extend_from_slice(&available[..take]);
        }
        reader.consume(if done { take + 1 } else { take });
        if too_long {
            partial.clear();
            return Ok(Line::TooLong);
        }
        if done {
            let mut line = std::mem::take(partial);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if line.len() > MAX_LINE_BYTES {
                return Ok(Line::TooLong);
            }
            return Ok(Line::Complete(line));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::BufReader;

    async fn lines(input: &[u8]) -> Vec<Line> {
        let mut reader = BufReader::with_capacity(7, input);
        let mut partial = Vec::new();
        let mut out = Vec::new();
        loop {
            let line = next_line(&mut reader, &mut partial).await.unwrap();
            let end = matches!(line, Line::Eof | Line::TooLong);
            out.push(line);
            if end {
                return out;
            }
        }
    }

    #[tokio::test]
    async fn splits_on_newlines_across_buffer_refills() {
        assert_eq!(
            lines(b"{\"a\":1}\n\r\nsecond line\r\ntail").await,
            vec![
                Line::Complete(b"{\"a\":1}".to_vec()),
                Line::Complete(Vec::new()),
                Line::Complete(b"second line".to_vec()),
                Line::Eof,
            ]
        );
    }

    #[tokio::test]
    async fn limit_is_one_mebibyte_of_content() {
        let mut exact = vec![b'x'; MAX_LINE_BYTES];
        exact.push(b'\n');
        assert_eq!(
            lines(&exact).await,
            vec![Line::Complete(vec![b'x'; MAX_LINE_BYTES]), Line::Eof]
        );
        let mut over = vec![b'x'; MAX_LINE_BYTES + 1];
        over.push(b'\n');
        assert_eq!(lines(&over).await, vec![Line::TooLong]);
        // No newline at all: refused as soon as the limit is passed, not at EOF.
        assert_eq!(
            lines(&vec![b'y'; MAX_LINE_BYTES + 10]).await,
            vec![Line::TooLong]
        );
    }
}
