//! One outgoing transfer: its manifest, where its bytes come from, and which of its chunks are
//! out (`docs/delivery.md#file-transfers`).

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;

use courier_engine::Millis;
use courier_proto::{file_chunk_id, ChunkHeader};

use super::progress::Progress;
use crate::store::media::OutgoingRow;

/// Where the chunks' bytes come from now.
#[derive(Debug, Clone)]
pub enum Source {
    Path(PathBuf),
    Bytes(Arc<Vec<u8>>),
    /// Bytes lost with an earlier process: nothing goes until the app hands them over again.
    Missing,
}

#[derive(Debug)]
pub struct Outgoing {
    pub row: OutgoingRow,
    pub source: Source,
    /// Submitted and not acknowledged: in the outbox, or — while the bytes are missing — only
    /// in storage.
    pub in_flight: BTreeSet<u32>,
    /// Unacknowledged chunks to submit again before new ones (their bytes came back).
    pub resubmit: BTreeSet<u32>,
    pub acked_bytes: u64,
    pub progress: Progress,
}

impl Outgoing {
    pub fn new(row: OutgoingRow, source: Source, in_flight: BTreeSet<u32>, now: Millis) -> Self {
        let mut transfer = Self {
            row,
            source,
            in_flight,
            resubmit: BTreeSet::new(),
            acked_bytes: 0,
            progress: Progress::new(0, now),
        };
        transfer.acked_bytes = (0..transfer.row.next_index)
            .filter(|i| !transfer.in_flight.contains(i))
            .map(|i| transfer.len_of(i))
            .sum();
        transfer.progress = Progress::new(transfer.acked_bytes, now);
        transfer
    }

    pub fn header(&self, index: u32) -> ChunkHeader {
        let row = &self.row;
        ChunkHeader {
            file_id: row.file_id.clone(),
            generation: row.generation,
            index,
            count: row.count,
            size: row.size,
            chunk_size: row.chunk_size,
            sha256: row.sha256.clone(),
            details: (index == 0).then(|| row.details.clone()),
        }
    }

    pub fn chunk_id(&self, index: u32) -> String {
        file_chunk_id(&self.row.file_id, self.row.generation, index)
    }

    pub fn len_of(&self, index: u32) -> u64 {
        courier_proto::media::span(self.row.size, self.row.chunk_size, index).1
    }

    pub fn acked_chunks(&self) -> u32 {
        self.row.next_index - self.in_flight.len() as u32
    }

    pub fn complete(&self) -> bool {
        self.row.next_index == self.row.count && self.in_flight.is_empty()
    }

    pub fn has_bytes(&self) -> bool {
        !matches!(self.source, Source::Missing)
    }

    /// The next chunk to put in the outbox, if the window has room: an unacknowledged one
    /// first, then the first never sent.
    pub fn next_chunk(&mut self, window: u32) -> Option<u32> {
        if !self.has_bytes() {
            return None;
        }
        if let Some(index) = self.resubmit.pop_first() {
            return Some(index);
        }
        if self.in_flight.len() as u32 >= window || self.row.next_index >= self.row.count {
            return None;
        }
        let index = self.row.next_index;
        self.row.next_index += 1;
        self.in_flight.insert(index);
        Some(index)
    }

    /// Chunk `index`'s bytes, read from the source.
    pub fn read(&self, index: u32) -> io::Result<Vec<u8>> {
        let (start, len) = courier_proto::media::span(self.row.size, self.row.chunk_size, index);
        match &self.source {
            Source::Bytes(bytes) => Ok(bytes[start as usize..(start + len) as usize].to_vec()),
            Source::Path(path) => {
                let mut file = File::open(path)?;
                file.seek(SeekFrom::Start(start))?;
                let mut buf = vec![0u8; len as usize];
                file.read_exact(&mut buf)?;
                Ok(buf)
            }
            Source::Missing => Err(io::Error::new(
                io::ErrorKind::NotFound,
                "the transfer's bytes are not here: the app must hand them over again",
            )),
        }
    }
}
