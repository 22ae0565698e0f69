//! One incoming transfer: its manifest, its partial file, and the checks before a file takes
//! its final name (`docs/delivery.md#receiving-files`).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use courier_engine::Millis;
use courier_proto::{Chunk, ChunkHeader};
use sha2::{Digest, Sha256};

use super::progress::Progress;
use crate::store::media::{IncomingRow, TransferState};

/// The folder of partial files inside the media directory: a partial file never carries a
/// final name, and a rename within one file system is atomic.
pub const PARTIAL_DIR: &str = ".partial";

#[derive(Debug)]
pub struct Incoming {
    pub row: IncomingRow,
    pub progress: Progress,
}

impl Incoming {
    /// A new assembly for the transfer `header` describes, from `sender`.
    pub fn open(dir: &Path, sender: &str, header: &ChunkHeader, now: Millis) -> io::Result<Self> {
        let partial = partial_name(sender, &header.file_id, header.generation);
        let path = dir.join(PARTIAL_DIR).join(&partial);
        fs::create_dir_all(dir.join(PARTIAL_DIR))?;
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&path)?;
        file.set_len(header.size)?;
        Ok(Self {
            row: IncomingRow {
                sender: sender.to_owned(),
                file_id: header.file_id.clone(),
                generation: header.generation,
                size: header.size,
                chunk_size: header.chunk_size,
                count: header.count,
                sha256: header.sha256.clone(),
                details: None,
                held: Vec::new(),
                held_count: 0,
                partial,
                path: None,
                state: TransferState::Active,
                started_at: now,
                touched_at: now,
            },
            progress: Progress::new(0, now),
        })
    }

    pub fn resumed(row: IncomingRow, now: Millis) -> Self {
        let held = held_bytes(&row);
        Self {
            row,
            progress: Progress::new(held, now),
        }
    }

    pub fn partial_path(&self, dir: &Path) -> PathBuf {
        dir.join(PARTIAL_DIR).join(&self.row.partial)
    }

    /// Whether `header` describes this very transfer (a peer may not change it midway).
    pub fn matches(&self, header: &ChunkHeader) -> bool {
        let row = &self.row;
        row.size == header.size
            && row.count == header.count
            && row.chunk_size == header.chunk_size
            && row.sha256 == header.sha256
    }

    /// Writes `chunk` at its place; the returned handle is synced before the step commits.
    pub fn write(&mut self, dir: &Path, chunk: &Chunk) -> io::Result<File> {
        let (start, _) = chunk.header.span(chunk.header.index);
        let mut file = OpenOptions::new()
            .write(true)
            .open(self.partial_path(dir))?;
        file.seek(SeekFrom::Start(start))?;
        file.write_all(&chunk.bytes)?;
        self.row.hold(chunk.header.index);
        if chunk.header.index == 0 {
            self.row.details.clone_from(&chunk.header.details);
        }
        Ok(file)
    }

    pub fn held_bytes(&self) -> u64 {
        held_bytes(&self.row)
    }

    pub fn complete(&self) -> bool {
        self.row.held_count == self.row.count
    }

    /// Whether the partial file's bytes are the file the sender hashed.
    pub fn verify(&self, dir: &Path) -> io::Result<bool> {
        let (digest, len) = super::digest::file(&self.partial_path(dir), Some(self.row.size))?;
        Ok(len == self.row.size && digest == self.row.sha256)
    }
}

fn held_bytes(row: &IncomingRow) -> u64 {
    (0..row.count)
        .filter(|&i| row.holds(i))
        .map(|i| courier_proto::media::span(row.size, row.chunk_size, i).1)
        .sum()
}

/// The partial file's name: derived from who sent what, so two senders' file ids never meet,
/// and from the generation, so a restarted transfer starts from an empty file.
fn partial_name(sender: &str, file_id: &str, generation: u32) -> String {
    let digest = Sha256::digest(format!("{sender}\n{file_id}").as_bytes());
    let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
    format!("{hex}.{generation}.part")
}

/// A name for a received file in `dir` that no file has and `taken` does not hold: the
/// sender's name with path parts, control characters and leading dots removed (the file id
/// when nothing is left), numbered ` (2)`, ` (3)`, … when it is taken.
pub fn final_path(
    dir: &Path,
    file_name: Option<&str>,
    file_id: &str,
    taken: &[PathBuf],
) -> PathBuf {
    let base = file_name
        .map(|name| {
            let last = name.rsplit(['/', '\\']).next().unwrap_or_default();
            let clean: String = last
                .chars()
                .map(|c| if c.is_control() || c == ':' { '_' } else { c })
                .collect();
            let clean = clean.trim_start_matches('.').trim().to_owned();
            truncate(clean, 200)
        })
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| truncate(file_id.replace(['/', '\\', ':'], "_"), 200));
    let (stem, ext) = match base.rfind('.') {
        Some(dot) if dot > 0 => (&base[..dot], &base[dot..]),
        _ => (base.as_str(), ""),
    };
    let free = |p: &PathBuf| !p.exists() && !taken.contains(p);
    let first = dir.join(&base);
    if free(&first) {
        return first;
    }
    (2u32..)
        .map(|n| dir.join(format!("{stem} ({n}){ext}")))
        .find(free)
        .expect("some number is free")
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_names_never_leave_the_directory_nor_collide() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert_eq!(
            final_path(d, Some("../../etc/passwd"), "f", &[]),
            d.join("passwd")
        );
        assert_eq!(final_path(d, Some("..."), "f1", &[]), d.join("f1"));
        assert_eq!(final_path(d, None, "f1", &[]), d.join("f1"));
        std::fs::write(d.join("a.txt"), b"x").unwrap();
        let taken = vec![d.join("a (2).txt")];
        assert_eq!(
            final_path(d, Some("a.txt"), "f", &taken),
            d.join("a (3).txt")
        );
    }
}
