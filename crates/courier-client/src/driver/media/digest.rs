//! SHA-256 of a file's bytes, read in blocks so a large file is never held whole.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use sha2::{Digest, Sha256};

const BLOCK: usize = 1 << 20;

/// The lowercase hex digest of `path`'s first `len` bytes (its whole length when `None`), and
/// how many bytes that was.
pub fn file(path: &Path, len: Option<u64>) -> io::Result<(String, u64)> {
    let file = File::open(path)?;
    let mut reader = match len {
        Some(len) => Box::new(file.take(len)) as Box<dyn Read>,
        None => Box::new(file),
    };
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; BLOCK];
    let mut total = 0u64;
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        total += n as u64;
    }
    Ok((hex(&hasher.finalize()), total))
}

pub fn bytes(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}
